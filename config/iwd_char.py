# IWD: weight decay on the Input-Norm scale vectors only (paper 2.2).
#   python train.py config/iwd_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/iwd_char"
sv_weight_decay = 'iwd'
