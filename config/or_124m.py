# OR: every scale vector as beta * Norm(alpha) (paper 3.3).
#   torchrun --standalone --nproc_per_node=8 train.py config/or_124m.py
from config.baseline_124m import *  # noqa: F401,F403

out_dir = "out/or_124m"
sv_reparam = 'or'
