# DNP: g_out * Norm(W(g_in * Norm(x))) on each Input-Norm-fed map (paper 3.2).
#   python train.py config/dnp_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/dnp_char"
sv_placement = 'dnp'
