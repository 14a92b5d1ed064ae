from rmqstore_cli.app import main

main()
