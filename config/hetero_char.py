# HG: one scale vector per branch (q, k, v; gate, up) (paper 3.1).
#   python train.py config/hetero_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/hetero_char"
sv_hetero = True
