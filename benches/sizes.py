"""The models bench_step.py times, as numbers each framework's script reads
(no torch or jax here): the MLP, the GPT, and the GPT grown in width and in
context to show how the ratios hold as work grows."""

# name: (d, context). Every GPT has 4 layers, 4 heads, batch 8, vocab 1024.
GPT_SIZES = {"gpt": (256, 128), "gpt-d512": (512, 128), "gpt-d1024": (1024, 128), "gpt-t512": (256, 512)}
GPT_LAYERS, GPT_HEADS, GPT_BATCH, GPT_VOCAB = 4, 4, 8, 1024
MODEL_NAMES = ["mlp", *GPT_SIZES]
