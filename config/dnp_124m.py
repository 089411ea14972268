# DNP: g_out * Norm(W(g_in * Norm(x))) on each Input-Norm-fed map (paper 3.2).
#   torchrun --standalone --nproc_per_node=8 train.py config/dnp_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/dnp_124m"
sv_placement = 'dnp'
