import sys

from tag.cli import main

sys.exit(main())
