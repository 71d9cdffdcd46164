"""A Hugging Face fine-tune on tpu, written as for CUDA: a plain loop with
`model.to("tpu")`, then the Trainer with bf16 autocast, gradient
checkpointing and the fused AdamW, which picks tpu by itself. The only
device-specific text is the string "tpu". A tiny GPT-2 is built from a
config, so nothing is downloaded; swap in `from_pretrained("gpt2")` for the
real one.

    .venv/bin/python examples/hf_finetune.py
"""

import tempfile

import torch
import transformers

torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64)
model = transformers.GPT2LMHeadModel(config)
tokens = torch.randint(0, 256, (32, 32))

# A plain loop.
model.to("tpu")
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
for step in range(5):
    batch = tokens[step * 4:(step + 1) * 4].to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"loop step {step}: loss {loss.item():.4f}")


# The Trainer.
class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return len(tokens)

    def __getitem__(self, i):
        return {"input_ids": tokens[i], "labels": tokens[i]}


transformers.logging.set_verbosity_error()
args = transformers.TrainingArguments(
    output_dir=tempfile.mkdtemp(), per_device_train_batch_size=4, max_steps=8, logging_steps=2,
    learning_rate=3e-3, bf16=True, gradient_checkpointing=True, optim="adamw_torch_fused",
    save_steps=4, report_to=[], disable_tqdm=True,
)
trainer = transformers.Trainer(model=model, args=args, train_dataset=Tokens())
trainer.train()
print("trainer device", args.device, "losses", [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h])
print("head tied to the embedding:", model.lm_head.weight is model.transformer.wte.weight)
