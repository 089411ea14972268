# The unified strategy, HG + DNP + OR + IWD (paper 4), with DNP's g_out head-sized (DESIGN.md,
# "sv_dnp_width"): one head_dim vector per branch q, k, v shared by the heads, one scalar per branch
# gate, up.
#   python train.py config/unified_head_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/unified_head_char"
sv_hetero = True
sv_placement = 'dnp'
sv_dnp_width = 'head'
sv_reparam = 'or'
sv_weight_decay = 'iwd'
