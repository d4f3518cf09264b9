from postbacks.cli import main

main()
