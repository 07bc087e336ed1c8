"""RL math for the trainer: group-normalised advantages, PPO-clip with off-policy corrections."""
