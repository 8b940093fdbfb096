"""A stand-in for the GCE metadata server, run inside a local-cluster VM (GCE is out of reach).

It follows the real server's contract for what primary_nic uses: GET
/computeMetadata/v1/instance/network-interfaces/0/{ip,mac} answers text with the header
`Metadata-Flavor: Google`; a request without `Metadata-Flavor: Google` gets 403, an unknown
path 404. Every request is appended to a log file so tests can tell whether anything was asked.

Usage: python3 fake_gce_metadata.py PORT LOG ip=10.128.0.5 mac=42:01:0a:80:00:05
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/computeMetadata/v1/instance/network-interfaces/0/"


def make_handler(values, log_path):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            with open(log_path, "a") as log:
                log.write(f"{self.path} {self.headers.get('Metadata-Flavor')}\n")
            if self.headers.get("Metadata-Flavor") != "Google":
                return self.answer(403, "Missing Metadata-Flavor:Google header.")
            key = self.path[len(PREFIX) :] if self.path.startswith(PREFIX) else None
            if key not in values:
                return self.answer(404, "Not Found")
            return self.answer(200, values[key])

        def answer(self, code, body):
            self.send_response(code)
            self.send_header("Metadata-Flavor", "Google")
            self.send_header("Content-Type", "application/text")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    return Handler


def main():
    port, log_path = int(sys.argv[1]), sys.argv[2]
    values = dict(arg.split("=", 1) for arg in sys.argv[3:])
    ThreadingHTTPServer(("127.0.0.1", port), make_handler(values, log_path)).serve_forever()


if __name__ == "__main__":
    main()
