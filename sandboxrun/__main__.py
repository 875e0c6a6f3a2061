from sandboxrun.cli import main

main()
