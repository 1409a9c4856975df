"""polycast.engine"""
