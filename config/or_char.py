# OR: every scale vector as beta * Norm(alpha) (paper 3.3).
#   python train.py config/or_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/or_char"
sv_reparam = 'or'
