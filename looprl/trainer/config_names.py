"""Config keys users bring from elsewhere: renamed looprl fields and other frameworks' names, each
with the looprl field to use (`looprl.trainer.config.foreign_name_hint` words the hint)."""

from __future__ import annotations

RENAMED = {
    "trainer.one_step_ahead": " (it became trainer.max_async_steps: one_step_ahead = true is "
    "max_async_steps = 1)",
}
"""Fields that were renamed: the error for the old name says the new one."""

FOREIGN_NAMES: dict[str, tuple[str, str]] = {
    # TRL's GRPOConfig / transformers' TrainingArguments
    "learning_rate": ("optim.lr", ""),
    "adam_beta1": ("optim.beta1", ""),
    "adam_beta2": ("optim.beta2", ""),
    "lr_scheduler_type": ("optim.schedule", ""),
    "max_grad_norm": ("optim.grad_clip", ""),
    "num_generations": ("rollout.rollouts_per_task", ""),
    "per_device_train_batch_size": (
        "rollout.tasks_per_step",
        "TRL counts completions; a looprl step samples tasks_per_step x rollouts_per_task",
    ),
    "gradient_accumulation_steps": (
        "trainer.micro_batch_tokens",
        "looprl accumulates gradients over micro-batches of this many tokens",
    ),
    "max_completion_length": ("rollout.max_tokens", "a cap per assistant turn"),
    "beta": ("algorithm.overrides.kl_coef", ""),
    "epsilon": ("algorithm.overrides.eps_low", "and algorithm.overrides.eps_high"),
    "epsilon_high": ("algorithm.overrides.eps_high", ""),
    "num_iterations": ("algorithm.updates_per_batch", ""),
    "loss_type": ("algorithm.preset", ""),
    "num_train_epochs": ("trainer.steps", "a looprl run counts steps, not epochs"),
    "max_steps": ("trainer.steps", ""),
    "save_steps": ("trainer.save_every", ""),
    "save_total_limit": ("trainer.keep_last", ""),
    "eval_steps": ("trainer.eval_every", ""),
    "model_name_or_path": ("model.name", ""),
    "use_peft": ("model.lora", ""),
    "lora_target_modules": ("model.lora_targets", ""),
    "bf16": ("model.dtype", 'model.dtype = "bfloat16"'),
    "run_name": ("run.name", ""),
    "report_to": ("run.wandb", ""),
    # verifiers' names
    "rollouts_per_example": ("rollout.rollouts_per_task", ""),
    "batch_size": ("rollout.tasks_per_step", ""),
    "max_concurrent": ("rollout.max_concurrent_groups", ""),
    "env_id": ("env.name", ""),
    "env_args": ("env.kwargs", ""),
}
"""Field names of TRL and verifiers that people type, with looprl's field (and a note)."""
