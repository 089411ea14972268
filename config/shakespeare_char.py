# A character-level model of Tiny Shakespeare that trains on a laptop CPU in a few
# minutes: the sizes of nanoGPT's CPU recipe (4 layers, 4 heads, 128 wide, block 64,
# batch 12, 2000 iterations, lr 1e-3 -> 1e-4, 100 warmup, beta2 0.99).
#   python prepare_data.py shakespeare_char && python train.py config/shakespeare_char.py
out_dir = "out/shakespeare_char"
dataset = "shakespeare_char"
eval_interval = 250
eval_iters = 20
log_interval = 50

batch_size = 12
block_size = 64
gradient_accumulation_steps = 1

n_layer = 4
n_head = 4
n_embd = 128
vocab_pad = 1          # 65 characters: padding the head buys nothing on a CPU

learning_rate = 1e-3   # a small model can take a larger step
max_iters = 2000
lr_decay_iters = 2000
min_lr = 1e-4
beta2 = 0.99           # a little larger because there are few tokens per iteration
warmup_iters = 100
# compile stays off (config/defaults.py): on 2 CPU cores the 2000 iterations took 128 s eager
# and 170 s compiled, inductor's ~45 s of compiling not earned back at 47-53 against 58-63 ms a
# step; unified 179 s either way (`/usr/bin/time python train.py config/X.py
# --compile=B`). The 124M configs compile: on a GPU that is where the speed is.
