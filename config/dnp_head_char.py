# DNP with a head-sized g_out (DESIGN.md, "sv_dnp_width"): g_out * Norm(W(g_in * Norm(x))) where
# g_out is one head_dim vector per branch q, k, v shared by the heads, and one scalar per branch
# gate, up (paper 3.2; DESIGN.md).
#   python train.py config/dnp_head_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/dnp_head_char"
sv_placement = 'dnp'
sv_dnp_width = 'head'
