# The baseline of the paper's 0.12B runs: a Pre-Norm Llama-style GPT at GPT-2 small's
# sizes (12 layers, 12 heads, 768 wide, block 1024: 124M parameters with tied
# embeddings) on FineWeb-Edu, 524,288 tokens per step, 10B tokens (one pass over
# sample-10BT), on one node of 8 GPUs:
#   python prepare_data.py fineweb_edu --num_tokens=10e9
#   torchrun --standalone --nproc_per_node=8 train.py config/baseline_124m.py
# Every *_124m.py config imports this file and changes only its variant's flags.
out_dir = "out/baseline_124m"
dataset = "fineweb_edu"
eval_interval = 500
eval_iters = 40
log_interval = 10

batch_size = 16                       # per GPU and micro-step
block_size = 1024
gradient_accumulation_steps = 4 * 8   # 16 * 1024 * 32 = 524,288 tokens per step over 8 GPUs

n_layer = 12
n_head = 12
n_embd = 768
vocab_pad = 64                        # 50257 -> 50304 rows: faster matmuls
tie_embeddings = True

learning_rate = 6e-4
max_iters = 19073                     # 10B tokens
warmup_iters = 700
min_lr = 6e-5
weight_decay = 0.1
beta2 = 0.95

compile = True
