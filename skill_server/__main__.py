import sys

from gradient_doctor.skill_server.cli import main

sys.exit(main())
