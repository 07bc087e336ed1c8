"""Local processes: the Temporal dev server, the Mooncake service, children that die with their parent."""
