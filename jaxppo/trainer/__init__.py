"""The offline PPO trainer: train state, jitted update steps, the loop, checkpoints, monitoring and guards."""
