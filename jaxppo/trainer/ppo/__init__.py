"""Offline PPO on the run harness: train state, buffer preparation, the jitted update step, the PPO plug-in."""
