"""polycast.runtime"""
