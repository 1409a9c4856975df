"""polycast.algorithms"""
