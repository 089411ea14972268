# HG: one scale vector per branch (q, k, v; gate, up) (paper 3.1).
#   torchrun --standalone --nproc_per_node=8 train.py config/hetero_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/hetero_124m"
sv_hetero = True
