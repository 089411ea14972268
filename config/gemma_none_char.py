# Gemma-like norms (QK-norm and post-norms, both Output-Norms); no weight decay on scale vectors.
#   python train.py config/gemma_none_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/gemma_none_char"
qk_norm = True
post_norm = True
sv_weight_decay = 'none'
