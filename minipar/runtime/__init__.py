"""The runtime around the trainer: starting ranks (`launch`, `torchrun`), watching them
(`heartbeat`), checking a run before any rank starts (`preflight`), checkpoints, Hugging Face
weights in and out, the training loop and its supervision (`run`), text generation.

The third of the package's four layers (every chapter): it reads the trainer and the plan,
never the book's helpers: plan <- trainer <- runtime <- teach.
"""
