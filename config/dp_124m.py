# DP: a second scale vector on the output side of each Input-Norm-fed map (paper 3.2).
#   torchrun --standalone --nproc_per_node=8 train.py config/dp_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/dp_124m"
sv_placement = 'dp'
