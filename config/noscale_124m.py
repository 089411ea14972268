# No scale vectors at all: every norm is parameter-free (paper Fig. 1 ablation).
#   torchrun --standalone --nproc_per_node=8 train.py config/noscale_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/noscale_124m"
scale_vectors = False
