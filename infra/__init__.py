"""What the work runs on: pools and affinity, job config, Temporal plumbing, the local stack, stores."""
