from postbacks.cli import main
from postbacks.tools.procs import follow_parent

follow_parent()
main()
