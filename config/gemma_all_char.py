# Gemma-like norms (QK-norm and post-norms, both Output-Norms); weight decay on every scale vector.
#   python train.py config/gemma_all_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/gemma_all_char"
qk_norm = True
post_norm = True
sv_weight_decay = 'all'
