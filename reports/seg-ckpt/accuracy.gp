# vramlab report: gnuplot accuracy.gp in this folder re-renders accuracy.png
if (!exists("vl_png")) vl_png = 'accuracy.png'
set terminal png size 1000,480 noenhanced
set output vl_png
set title 'Held-out pixel accuracy per epoch (run scale, one seed)'
set xlabel 'epoch'
set ylabel 'pixel accuracy'
set xtics 1
set mxtics 1
set grid
set key outside right top
plot 'accuracy.dat' index 0 using 1:2 with linespoints lw 10 dt 1 pt 4 ps 3.0 title 'before', 'accuracy.dat' index 1 using 1:2 with linespoints lw 6 dt 2 pt 5 ps 2.1 title 'ckpt (= before)', 'accuracy.dat' index 2 using 1:2 with linespoints lw 2 dt 3 pt 6 ps 1.2 title 'relu_off (= before)', 'accuracy.dat' index 3 using 1:2 with linespoints lw 2 dt 4 pt 7 ps 1.2 title 'accum', 'accuracy.dat' index 4 using 1:2 with linespoints lw 6 dt 5 pt 8 ps 2.1 title 'amp', 'accuracy.dat' index 5 using 1:2 with linespoints lw 2 dt 1 pt 9 ps 1.2 title 'loader (= amp)', 'accuracy.dat' index 6 using 1:2 with linespoints lw 2 dt 2 pt 10 ps 1.2 title 'after'
