# ER: every scale vector as exp(beta) * exp(alpha - mean(alpha)) (paper 3.3).
#   python train.py config/er_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/er_char"
sv_reparam = 'er'
