#!/bin/sh
# Development certificates for the TLS options: a CA, the gateway's client-port certificate and
# the internal certificate that frontend, stt and oracle serve and the gateway presents (mTLS).
#
#   deploy/compose/make-certs.sh DIR [NAME ...]
#
# NAME: more names (DNS names or IP addresses) clients dial the gateway by, beside localhost,
# 127.0.0.1 and gateway. DIR gets ca.crt, gateway.crt/.key, internal.crt/.key (the layout
# deploy/compose/tls.yml mounts) and ca.key to sign more. For the Helm chart's existing Secrets:
#   kubectl create secret tls kame-gateway-tls --cert=DIR/gateway.crt --key=DIR/gateway.key
#   kubectl create secret generic kame-internal-tls --type=kubernetes.io/tls \
#     --from-file=tls.crt=DIR/internal.crt --from-file=tls.key=DIR/internal.key \
#     --from-file=ca.crt=DIR/ca.crt
# Production: a CA of your own or cert-manager (tls.certManager in the chart).
set -eu

dir=${1:?usage: make-certs.sh DIR [GATEWAY-NAME ...]}
shift
mkdir -p "$dir"
cd "$dir"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
  -keyout ca.key -out ca.crt -subj "/CN=KAME development CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"

# issue NAME EXTENDED-KEY-USAGE SUBJECT-ALT-NAMES: NAME.key and NAME.crt signed by the CA.
issue() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf '%s\n' "subjectAltName=$3" "extendedKeyUsage=$2" \
    "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 \
    -extfile "$1.ext" -out "$1.crt"
  rm "$1.csr" "$1.ext"
}

names="DNS:localhost,IP:127.0.0.1,DNS:gateway"
for name in "$@"; do
  case $name in
    *:* | *[0-9]) names="$names,IP:$name" ;;  # IPv6, or IPv4 (a DNS name ends in a letter)
    *) names="$names,DNS:$name" ;;
  esac
done
issue gateway serverAuth "$names"
# kame-internal: the one name the gateway verifies (it dials frontend replicas by address);
# the compose service names as well, for clients that verify the name they dial.
issue internal serverAuth,clientAuth "DNS:kame-internal,DNS:frontend,DNS:frontend-gpu,DNS:stt,DNS:oracle"

rm -f ca.srl
chmod 600 ca.key
# The containers run as uid 10001 and read the keys through a bind mount: readable by all
# (development certificates only).
chmod 644 gateway.key internal.key
echo "certificates in $PWD: ca.crt, gateway.crt/.key, internal.crt/.key" >&2
