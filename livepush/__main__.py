import sys

# The package's entry, not livepush.cli.commands': it holds the stop signals back before that imports.
from .cli import main

sys.exit(main())
