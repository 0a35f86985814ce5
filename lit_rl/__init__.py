"""lit_rl: PyTorch Lightning RL for language models with verifiable rewards.

Two algorithms as composable parts:

* dLLM-ERILS (masked diffusion LMs, on-policy + external rollouts, SPG surrogate);
* AR double-rollout GRPO (continuation-based reward estimation for autoregressive models).
"""

__version__ = "0.1.0"
