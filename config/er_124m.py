# ER: every scale vector as exp(beta) * exp(alpha - mean(alpha)) (paper 3.3).
#   torchrun --standalone --nproc_per_node=8 train.py config/er_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/er_124m"
sv_reparam = 'er'
