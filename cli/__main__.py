from musketeers.cli.main import main

main()
