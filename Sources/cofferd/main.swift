print("cofferd")
