# The unified strategy, HG + DNP + OR + IWD (paper 4).
#   python train.py config/unified_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/unified_char"
sv_hetero = True
sv_placement = 'dnp'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
