import sys

from patchkit import interrupt

interrupt.install()  # before the heavier imports, so an early ^C is handled like a late one

from patchkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
