import sys

try:
    from patchkit.cli import main
except KeyboardInterrupt:  # ^C while still importing: nothing was started
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
