# IWD: weight decay on the Input-Norm scale vectors only (paper 2.2).
#   torchrun --standalone --nproc_per_node=8 train.py config/iwd_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/iwd_124m"
sv_weight_decay = 'iwd'
