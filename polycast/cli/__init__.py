"""polycast.cli"""
