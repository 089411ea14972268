# The baseline at CPU size, named like its variants (config/<variant>_char.py).
#   python train.py config/baseline_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/baseline_char"
