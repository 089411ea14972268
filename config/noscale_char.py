# No scale vectors at all: every norm is parameter-free (paper Fig. 1 ablation).
#   python train.py config/noscale_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/noscale_char"
scale_vectors = False
