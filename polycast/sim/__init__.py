"""polycast.sim"""
