"""`python -m trainprof`: the command line, as the `trainprof` command."""

from trainprof.cli import main

if __name__ == "__main__":
    main()
