"""`python -m rollart.cli` runs the `rollart` command (the tests and the autoscaler's workers start it so)."""

from rollart.cli.main import main

if __name__ == "__main__":
    main()
