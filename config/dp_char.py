# DP: a second scale vector on the output side of each Input-Norm-fed map (paper 3.2).
#   python train.py config/dp_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/dp_char"
sv_placement = 'dp'
