"""The built-in web page: static HTML, CSS and JavaScript, served by rawpage/server/web.py."""
