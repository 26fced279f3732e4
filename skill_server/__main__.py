import sys

from skill_server.cli import main

sys.exit(main())
