from bwopt.app import main

main()
