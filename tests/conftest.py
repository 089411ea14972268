import os
import sys

# the tests import the project's modules (model, prepare_data, ...) from the repo root
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
