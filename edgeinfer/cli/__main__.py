import sys

from edgeinfer.cli.commands import main

sys.exit(main())
