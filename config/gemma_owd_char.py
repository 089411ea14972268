# Gemma-like norms (QK-norm and post-norms); weight decay on the Output-Norm vectors only, the
# other half of the paper's claim (DESIGN.md).
#   python train.py config/gemma_owd_char.py
from config.shakespeare_char import *  # noqa: F401,F403

out_dir = "out/gemma_owd_char"
qk_norm = True
post_norm = True
sv_weight_decay = 'owd'
