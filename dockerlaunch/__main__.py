from dockerlaunch.cli import main

main()
